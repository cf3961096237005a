"""The thin TensorFlow / TFF layer of tff-mf (streaming noise, DPQuery, aggregators)."""
