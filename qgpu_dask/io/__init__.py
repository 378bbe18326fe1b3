"""Readers and sources of acquisitions."""
