"""The only code that reads or writes hardware state."""
