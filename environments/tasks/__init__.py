"""Task definitions: the record schema and the synthetic generators."""
