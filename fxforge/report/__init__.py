"""Self-contained HTML reports of compiled graphs (docs/report.md).

* ``html``: ``render`` / ``write_report`` of one ``Compiled`` or several (one tab each);
* ``memory``: the memory picture (buffers by address over the schedule) and live-bytes curves;
* ``graphview``: kernel groups along the schedule, and the nodes the page draws a window at a time;
* ``timeline``: passes and compile stages over time, each pass's code diff and metadata changes;
* ``kernels``: each kernel's backend, launch arguments and source;
* ``assets``: the page's inline CSS and script;
* ``record``: what ``compile_graph`` records for the report (input graph sketch, code per pass);
* ``hooks``: compile watchers (the CLI) and tlparse artifacts under ``TORCH_TRACE``.
"""
