"""Sources: the apiserver, a manifest directory or an upstream frontend, and the intake
that validates every object they send before the store keeps it."""
