"""Data synthesis (the method's step 1): tasks beyond KernelBench and verified solutions for them."""
