"""Process plumbing (launching, forking, killing, reaping workers and subjects): imports nothing else of musacoder."""
