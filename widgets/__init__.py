"""Display-only Textual widgets; they render view-models and never call collectors."""
