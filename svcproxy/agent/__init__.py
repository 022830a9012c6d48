"""What every backend shares on the node: sync runner, health, metrics, conntrack."""
