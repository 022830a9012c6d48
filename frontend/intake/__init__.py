"""The intake: every object a source sends is validated against its kind's rules, parsed,
or refused alone here (logged once, counted), before the store keeps it."""
