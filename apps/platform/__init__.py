"""The ground floor: error types, names and the event bus that every app may import.

Nothing here imports another app. `names` and `errors` import no Django either: the node agent
uses them and runs without Django.
"""
