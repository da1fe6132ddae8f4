"""Security: TLS listeners (tls.py). Sans-IO where it can be: contexts and principals are
built from configuration and certificates, the Trio stream work is in the connection class."""
