"""ghpsim, the product: its command line (`ghpsim.cli`). The library is `simulator` (predictions)
and `validator` (real torch runs); this package imports neither until a command runs."""
