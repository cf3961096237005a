"""Next-word prediction for DP federated learning (Denisov et al. 2022, Sec 5).

- `data`: `load_federated_data("stackoverflow" | "pydocs" | "pydocs_modules" | "synthetic", ...)`.
- `preprocessing`: token ids, `build_preprocess_fn` (App I settings).
- `model`: the 4,050,748-parameter LSTM and its TFF model function.
- `metrics`: accuracy with/without OOV and EOS, masked loss.
- `pydocs`: the docstring dataset (no download).
- `fixtures`: a tiny StackOverflow copy in TFF's on-disk format, for tests.
"""

# The training corpora ``data.load_federated_data`` loads, and the pydocs build option
# (``pydocs.build``'s ``client_unit``) each docstring dataset's name stands for; here, free of
# TensorFlow, so the harness's flags validate them without loading it.
DATASETS = ("stackoverflow", "pydocs", "pydocs_modules", "synthetic")
PYDOCS_CLIENT_UNITS = {"pydocs": "object", "pydocs_modules": "module"}

# The LSTM kernels the model can run (``model.create_keras_model``'s ``lstm_kernel``, the
# harness's --lstm_kernel): "keras", Keras' own (its LSTM layer on a GPU, the same cell in
# the generic RNN wrapper on a CPU), and "block", TensorFlow's fused BlockLSTMV2 op
# (``model.BlockLSTM``). Same variables, initial values and function.
LSTM_KERNELS = ("keras", "block")
DEFAULT_LSTM_KERNEL = "keras"
