"""The thin TensorFlow / TFF layer of tff-mf (streaming noise, DPQuery, aggregators).

Importing it sets ``TF2_BEHAVIOR=1`` (unless set) before TensorFlow is imported:
TensorFlow 2.14 imported for the first time inside absl's ``app.run`` otherwise
starts its eager context too early and Keras then builds graph placeholders (an
LSTM crashes with "'SymbolicTensor' object cannot be interpreted as an integer").
Without the TensorFlow extra, importing it is one ImportError line naming the extra.
"""

import os

from tff_mf import optional

if optional.missing("tff"):
  raise ImportError(optional.message("tff", "tff_mf.tf"))

os.environ.setdefault("TF2_BEHAVIOR", "1")
