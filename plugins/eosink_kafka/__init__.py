"""The ``kafka`` sink: exactly-once into Apache Kafka through transactions (confluent-kafka)."""
