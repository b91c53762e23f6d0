"""What must know the backend, in one package.

Everything else in keras_transformer is written with `keras.ops` and runs
unchanged on TensorFlow, JAX and PyTorch. The modules here choose, per
backend, how a few operations are computed:

- `state`: whether the running code is a compiled decoding call, and how
  it is compiled (set by `decoding.compiled.CompiledFunction`);
- `products`: the products of inputs and kernels (oneDNN under torch on
  the CPU; int8 products while decoding);
- `layouts`: under torch, kernels that lie in memory as torch's `Linear`
  weights do, for the one-row products of a loaded translator;
- `attention`: torch's fused attention on the layouts our layers keep;
- `shapes`: reshapes and cache writes without Keras's symbolic checks
  under torch;
- `norms`: layer normalization, bias additions and a beam's log softmax
  under torch's direct calls;
- `loops`: `while_loop`, whose bodies a torch decoding call records once
  and replays;
- `random`: seeded dropout whose stream lives in host memory under torch;
- `cross_entropy`: the label-smoothed loss with its gradient written out;
- `keras_private`: the private Keras names still read (two scopes, and the
  optimizer's gradient hook and pieces of its update that accumulation
  over TensorFlow replicas runs), each with the public route, or a clear
  error, where a Keras release drops it.

Nothing here changes Keras, TensorFlow, JAX or PyTorch: importing the
package installs nothing, and each function is called by our own layers
and searches.
"""
