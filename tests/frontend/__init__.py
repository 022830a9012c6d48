"""Tests of the frontend's pieces, each alone (store, computation, publication)."""
