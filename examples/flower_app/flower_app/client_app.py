"""The ClientApp: local gradient descent on the client's partition of the data."""

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from . import task

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
  """Returns the model after five local steps (the server clips and noises the update)."""
  w = msg.content["arrays"].to_numpy_ndarrays()[0]
  partition = int(context.node_config["partition-id"])
  new = task.local_train(w, partition)
  return Message(RecordDict({"arrays": ArrayRecord([new]),
                             "metrics": MetricRecord({"num-examples": 16})}), reply_to=msg)
