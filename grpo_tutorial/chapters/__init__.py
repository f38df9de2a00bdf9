"""Chapter tools: complete runs and helpers that the chapters show, built on the core stages."""
