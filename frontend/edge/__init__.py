"""The edge: the kinds the frontend reads (Service, EndpointSlice, Node), one module each
holding its rules (exactly the apiserver's), its decode and its messages, and the readers
they share (names, addresses, limits, verdicts). It imports nothing else of the frontend but
``runtime``."""
