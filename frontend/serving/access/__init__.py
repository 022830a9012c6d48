"""Access: who calls (certificates, tokens) and what they may read (authorization, TLS)."""
