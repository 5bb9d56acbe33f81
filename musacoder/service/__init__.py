"""The HTTP reward service (`musacoder serve`) and its async client; needs the `serve` extra."""
