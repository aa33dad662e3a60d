"""The core: the layers below the verbs (docs/architecture.md, "The tree"). Kept empty: each
layer is imported by its own module path."""
