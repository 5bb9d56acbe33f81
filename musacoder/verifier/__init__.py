"""MooreEval: static checks -> compile -> correctness -> legality -> timing -> reward -> feedback."""
