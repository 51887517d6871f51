"""The runtime layer: what every component stands on (settings, the Kafka bus, the
database, the typed recipe, plugins, datasets, embedded services, the chat format).
Imports only `schema/`."""
