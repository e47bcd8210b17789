"""The Textual application: one App, built by one factory shared by the CLI and the tests."""
