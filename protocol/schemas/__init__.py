"""canopy's own broker-to-broker messages, in Kafka's JSON schema format."""
