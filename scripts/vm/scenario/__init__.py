"""The vm-e2e guest's scenario, one module per section (see ``__main__``)."""
