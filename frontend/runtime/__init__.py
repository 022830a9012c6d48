"""What every layer of the frontend may use: its metrics, the event-loop histogram and the
garbage collector's tuning. It imports nothing else of the frontend."""
