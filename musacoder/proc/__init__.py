"""Process plumbing (launching, killing, reaping workers and subjects): imports nothing else of musacoder."""
