package sim

import (
	"bytes"
	"html/template"
	"io"
	"strings"
)

var htmlPage = template.Must(template.New("sim").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>imgctx simulate: {{.R.Workload}} on {{.R.Model}}</title>
<style>
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.5em; color: #1d2330; background: #f6f7f9; }
table { border-collapse: collapse; background: #fff; } th, td { padding: .25em .7em; border-bottom: 1px solid #e3e6eb; text-align: right; }
th:first-child, td:first-child { text-align: left; white-space: nowrap; } tr.imgctx, td.imgctx, th.imgctx { background: #eef3fb; }
.notes p { max-width: 60em; } svg { background: #fff; max-width: 100%; height: auto; }
</style></head><body>
<h1>{{.Title}}</h1>
<table id="policies">
{{range $i, $row := .Rows}}<tr>{{range $j, $c := $row}}{{if eq $i 0}}<th{{if index $.Ours $j}} class="imgctx"{{end}}>{{$c}}</th>{{else}}<td{{if index $.Ours $j}} class="imgctx"{{end}}>{{$c}}</td>{{end}}{{end}}</tr>
{{end}}</table>
{{with .R.Frontier}}{{if .Points}}<h2>Hindsight frontier</h2><p>{{.Assumes}}</p>
<table id="frontier"><tr><th>images per request</th><th>dollars</th><th>removal batches</th></tr>
{{range .Points}}<tr><td>{{printf "%.1f" .Images}}</td><td>{{printf "$%.2f" .Dollars}}</td><td>{{.Batches}}</td></tr>{{end}}</table>{{end}}{{end}}
<h2>Cost and prompt size per step</h2>
{{.SVG}}
<div class="notes">{{range .R.Notes}}<p>{{.}}</p>{{end}}</div>
</body></html>
`))

// WriteHTML writes the report as one self-contained page: the table of
// policies (imgctx's columns marked), the hindsight frontier, the chart of
// WriteSVG inline, and the notes.
func (r *Report) WriteHTML(w io.Writer) error {
	var svg bytes.Buffer
	if err := r.WriteSVG(&svg); err != nil {
		return err
	}
	rows := r.rows()
	ours := make([]bool, len(rows[0]))
	for j, name := range rows[0] {
		ours[j] = strings.HasPrefix(name, "imgctx")
	}
	return htmlPage.Execute(w, map[string]any{"R": r, "Title": r.title(), "Rows": rows, "Ours": ours,
		"SVG": template.HTML(svg.String())}) // WriteSVG's own markup, its text escaped there
}
