# IPython kernel settings of the code-interpreter image (/etc/ipython): plain tracebacks (no
# ANSI colours, as E2B's kernel sends them), matplotlib's inline backend, so a figure made in
# a cell is returned as a PNG at its end without plt.show(), and our display extension
# (kernel/aegis_display.py: `chart` data of figures, `data` of DataFrames, saved images shown)
# and shell escapes without a terminal (kernel/aegis_shell.py: `!cmd` over pipes).
import sys

sys.path.append("/opt/aegis/code-interpreter/kernel")

c = get_config()  # noqa: F821
c.InteractiveShell.colors = "NoColor"
c.IPKernelApp.matplotlib = "inline"
c.InteractiveShellApp.extensions = ["aegis_display", "aegis_shell"]
