"""Stage 4, the algorithm as pure functions of arrays: advantages, the loss and its variants, DAPO's
group filtering and overlong penalty."""
