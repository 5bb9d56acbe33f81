"""Worker processes and the one-node pool that runs the verifier's stages on them."""
