"""Redis access: the endpoint (the primary, wherever it moved), the script runner
(EVALSHA, the fence prepended, WAIT) and each script's key list."""
