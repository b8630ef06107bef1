"""The reports of a run: the conversion report the rewrite fills (`conversion`), one typed
result per model (`record`), its renderings as terminal text and Markdown (`text`) and as one
HTML page (`html`), and one summary over the JSON reports of several runs (`merge`)."""
