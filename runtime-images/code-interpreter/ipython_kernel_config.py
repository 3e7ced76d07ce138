# IPython kernel settings of the code-interpreter image (/etc/ipython): plain tracebacks (no
# ANSI colours, as E2B's kernel sends them) and matplotlib's inline backend, so a figure made in
# a cell is returned as a PNG at its end without plt.show().
c = get_config()  # noqa: F821
c.InteractiveShell.colors = "NoColor"
c.IPKernelApp.matplotlib = "inline"
