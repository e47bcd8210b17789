"""The embedded demo recording (a real H200 session)."""
