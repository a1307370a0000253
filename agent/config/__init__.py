"""The one configuration model and its loader."""
