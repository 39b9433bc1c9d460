import cuda_extension
import torch.nn as nn


class ModelNew(nn.Module):
    """Every layer is one launch of a custom tiled SGEMM with the bias add and ReLU fused into its
    store (no ReLU after the last layer). Same nn.Sequential as the reference, used only to hold
    the parameters under the reference's names."""

    def __init__(self, input_size, hidden_layer_sizes, output_size):
        super(ModelNew, self).__init__()
        layers = []
        current_input_size = input_size
        for hidden_size in hidden_layer_sizes:
            layers.append(nn.Linear(current_input_size, hidden_size))
            layers.append(nn.ReLU())
            current_input_size = hidden_size
        layers.append(nn.Linear(current_input_size, output_size))
        self.network = nn.Sequential(*layers)
        self.linears = [m for m in self.network if isinstance(m, nn.Linear)]

    def forward(self, x):
        n = len(self.linears)
        for i, layer in enumerate(self.linears):
            x = cuda_extension.linear_act(x, layer.weight, layer.bias, i + 1 < n)
        return x
