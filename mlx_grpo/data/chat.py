"""System prompts shared by the data loader, the built-in model's warm start and the profiles."""

# The R1-style format that the xml_format and gsm8k_correctness rewards look for.
DEFAULT_SYSTEM_PROMPT = (
    "Respond in the following format:\n"
    "<reasoning>\n...\n</reasoning>\n"
    "<answer>\n...\n</answer>"
)
