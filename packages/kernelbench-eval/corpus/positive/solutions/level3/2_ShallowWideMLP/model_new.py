import cuda_extension
import torch.nn as nn


class ModelNew(nn.Module):
    """8.6 GB of weights: each layer is a cuBLAS SGEMM on torch's handle followed by a float4
    bias(+ReLU) epilogue, both inside one launcher call per layer. The reference's nn.Sequential
    holds the parameters under the same names."""

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

    def forward(self, x):
        linears = [m for m in self.network if isinstance(m, nn.Linear)]
        for i, layer in enumerate(linears):
            x = cuda_extension.linear_bias_act(x, layer.weight, layer.bias, i + 1 < len(linears))
        return x
