"""Each stage's invariants, the stage contract, and bad input on the stages' command lines."""
