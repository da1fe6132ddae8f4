"""Example data pipeline on canopy: a click-event generator and a Structured Streaming job."""
