"""`python -m keras_transformer translate|evaluate|plot-attention ...`"""

from keras_transformer.cli import main

main()
