"""The bench's report: the table `mlx-grpo bench` prints, and the main thread's share of each part.

`host_shares` reads the main thread's CPU time against the wall time: on the CPU backend MLX
computes on threads of its own (and on Metal on the GPU), so that share is the step's time in
Python, graph building and dispatch, outside MLX's compute.
"""

from mlx_grpo.commands import roofline


def host_shares(step: dict) -> dict:
    """The main thread's CPU time over the wall time, for the step and each timed part: the share
    spent outside MLX's compute (on the CPU backend MLX computes on threads of its own)."""
    walls = {"step": ("host_s", "total_s"), "rollout": ("rollout_host_s", "rollout_s"),
             "reference": ("reference_host_s", "reference_s"), "update": ("update_host_s", "update_s")}
    return {part: step[host] / step[wall] if step[wall] else 0.0 for part, (host, wall) in walls.items()}


def format_report(r: dict) -> str:
    s, lim = r["step"], r["limit"]
    lines = [
        f"{r['model']}: {r['trainable_parameters']:,} trainable, P={r['prompts']} G={r['generations']} "
        f"max_new_tokens={r['max_new_tokens']}, median of {r['measured_steps']} steps",
        f"prompt share of tokens {s['prompt_share']:.3f}; shared_prefix={str(r['shared_prefix']).lower()} "
        f"(a shared-prefix pass runs {s['shared_over_full_tokens']:.3f} of the padded rows' tokens)",
        f"{'':24}{'trainer':>10}{'limit':>10}",
        f"{'step (s)':24}{s['total_s']:10.2f}{lim['total_s']:10.2f}   ratio {r['step_over_limit']:.3f}",
        f"{'  rollout / generation':24}{s['rollout_s']:10.2f}{lim['generation_s']:10.2f}",
        f"{'  rewards':24}{s['rewards_s']:10.3f}" + (f"   judge {s['judge_s']:.3f}" if s["judge_s"] else ""),
        f"{'  reference pass':24}{s['reference_s']:10.2f}",
        f"{'  update / fwd+bwd':24}{s['update_s']:10.2f}{lim['forward_backward_s']:10.2f}"
        f"   (fwd+bwd plain {lim['forward_backward_plain_s']:.2f}, compiled {lim['forward_backward_compiled_s']:.2f})",
        f"{'rollout tokens/s':24}{r['rollout_tokens_per_s']:10.1f}{r['raw_generation_tokens_per_s']:10.1f}"
        f"   {r['rollout_engine']} against mlx-lm's BatchGenerator",
        f"{'update tokens/s':24}{r['update_tokens_per_s']:10.1f}{r['forward_backward_tokens_per_s']:10.1f}",
        f"{'peak memory (GB)':24}{s['update_peak_memory_gb']:10.3f}{lim['forward_backward_peak_memory_gb']:10.3f}"
        f"   update / fwd+bwd {r['update_memory_over_forward_backward']:.2f}; step peak {r['peak_memory_gb']:.3f}",
    ]
    h = r["host_share"]
    lines.append(f"{'main thread busy':24}{h['step']:10.2f}   rollout {h['rollout']:.2f}, reference "
                 f"{h['reference']:.2f}, update {h['update']:.2f} (its CPU time / wall: Python, graphs, dispatch)")
    lines += roofline.format_achieved(r)
    for c in r.get("compile_choices", []):
        lines.append(f"update's compile decision at inputs {c['shapes'][0]}: {c['choice']} "
                     f"(plain {c['seconds']['plain']:.2f} s, compiled {c['seconds']['compiled']:.2f} s)")
    return "\n".join(lines)
