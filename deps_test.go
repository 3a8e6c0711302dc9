package imgctx_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/imgctx/imgctx/"

// allowed is the import table of docs/design.md "Packages": for each package, the packages
// of this module it may import. Storage and media never import chat; the
// conversation model imports no I/O package of ours. A new package must be
// added here deliberately.
var allowed = map[string][]string{
	"":                     {},
	"blob":                 {},
	"reason":               {},
	"mimetype":             {},
	"chat":                 {"blob", "mimetype", "reason"},
	"imagestore":           {"blob"},
	"imagestore/storetest": {"blob", "imagestore"},
	"media":                {"blob", "mimetype", "reason"},
	"tokens":               {"blob", "chat"},
	"policy":               {"blob", "chat", "mimetype", "reason", "tokens"},
	"session":              {"blob", "chat", "imagestore", "policy", "reason"},
	"session/sessiontest":  {"blob", "chat", "policy", "session"},
	"session/sqlite":       {"chat", "session"},
	"session/postgres":     {"chat", "session"},
	"imagestore/s3":        {"blob", "imagestore"},
	"internal/testsvc":     {},
	"sim":                  {"blob", "chat", "engine", "gateway", "imagestore", "reason", "session", "tokens", "upstream", "wire", "wire/anthropic", "wire/gemini", "wire/jsonspan", "wire/openai", "wire/responses"},
	"wire":                 {"blob", "chat", "mimetype", "wire/jsonspan"},
	"wire/jsonspan":        {},
	"wire/wiretest":        {"chat", "wire"},
	"wire/openai":          {"chat", "wire", "wire/jsonspan"},
	"wire/responses":       {"chat", "wire", "wire/jsonspan", "wire/openai"},
	"wire/gemini":          {"chat", "wire", "wire/jsonspan"},
	"wire/anthropic":       {"chat", "wire", "wire/jsonspan"},
	"wire/flat":            {"wire", "wire/openai"},
	"upstream":             {"wire", "wire/anthropic", "wire/flat", "wire/gemini", "wire/openai", "wire/responses"},
	"engine":               {"blob", "chat", "imagestore", "media", "policy", "reason", "session", "tokens", "upstream", "wire", "wire/openai"},
	"recall":               {"chat", "engine"},
	"gateway":              {"blob", "chat", "engine", "imagestore", "reason", "recall", "session", "upstream", "wire", "wire/anthropic", "wire/gemini", "wire/openai", "wire/responses"},
	"internal/config":      {"imagestore", "media", "policy", "tokens"},
	"scripts/abmeter":      {"internal/bodies"},
	"scripts/agentcheck":   {},
	"scripts/attack":       {},
	"scripts/filesbench":   {"sim"},
	"internal/bodies":      {},
	"cmd/imgctx":           {"blob", "chat", "engine", "gateway", "imagestore", "internal/config", "media", "mimetype", "policy", "reason", "recall", "imagestore/s3", "session", "session/postgres", "session/sqlite", "sim", "tokens", "upstream"},
}

// forbidden are the rules of the design the table must never be widened
// to break: the gateway only does HTTP (it hands the engine a request and
// relays the answer), never sees pixels, never prices.
var forbidden = map[string][]string{
	"gateway": {"policy", "media", "tokens"},
}

// forbiddenStd are standard packages a pure layer must not use.
var forbiddenStd = map[string][]string{
	"chat":     {"os", "net", "net/http", "io/fs", "database/sql"},
	"blob":     {"os", "net", "net/http"},
	"policy":   {"os", "net", "net/http", "io/fs", "database/sql"},
	"mimetype": {"os", "net", "net/http"},
}

func TestImportTable(t *testing.T) {
	seen := map[string]bool{}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != "." || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		pkg := filepath.ToSlash(filepath.Dir(path))
		if pkg == "." {
			pkg = ""
		}
		seen[pkg] = true
		allow, ok := allowed[pkg]
		if !ok {
			t.Errorf("package %q is not in the import table of deps_test.go", pkg)
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			p := strings.Trim(imp.Path.Value, `"`)
			if rest, ok := strings.CutPrefix(p, module); ok {
				if !slices.Contains(allow, rest) {
					t.Errorf("%s imports %s, which the import table does not allow", path, rest)
				}
			}
			if slices.Contains(forbiddenStd[pkg], p) {
				t.Errorf("%s imports %s: package %s must stay free of I/O", path, p, pkg)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for pkg, rules := range forbidden {
		for _, p := range rules {
			if slices.Contains(allowed[pkg], p) {
				t.Errorf("the import table lets %s import %s, which the design forbids", pkg, p)
			}
		}
	}
	for pkg := range allowed {
		if !seen[pkg] {
			t.Errorf("import table lists %q, which has no Go files", pkg)
		}
	}
	if _, err := os.Stat("go.mod"); err != nil {
		t.Fatal("run from the module root")
	}
}

// formatNames are the names of wire formats: the upstream package's
// constants and each wire package's Wire.
var formatNames = map[string]bool{"OpenAI": true, "Anthropic": true, "Gemini": true, "LlamaCpp": true, "Ollama": true, "Wire": true}

// Outside wire/ nothing branches on a wire format's name: what differs
// between wires is a field of its Dialect (the one table is upstream.Wires,
// a map). A comparison or a case with a format constant fails this test.
func TestNoFormatSwitchOutsideWire(t *testing.T) {
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != "." || d.Name() == "testdata" || path == "wire") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		isFormat := func(e ast.Expr) bool {
			switch e := e.(type) {
			case *ast.SelectorExpr:
				x, ok := e.X.(*ast.Ident)
				return ok && formatNames[e.Sel.Name] && (x.Name == "upstream" || x.Name == "openai" || x.Name == "anthropic" || x.Name == "gemini" || x.Name == "responses")
			case *ast.Ident:
				return filepath.Dir(path) == "upstream" && formatNames[e.Name]
			}
			return false
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.BinaryExpr:
				if (n.Op == token.EQL || n.Op == token.NEQ) && (isFormat(n.X) || isFormat(n.Y)) {
					t.Errorf("%s: a branch on a wire format's name outside wire/", fset.Position(n.Pos()))
				}
			case *ast.CaseClause:
				for _, e := range n.List {
					if isFormat(e) {
						t.Errorf("%s: a case on a wire format's name outside wire/", fset.Position(e.Pos()))
					}
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The official SDKs are test clients only, and only under the sdk build
// tag: compiling them is the bulk of a cold `go test ./...`, so the
// README's test command leaves them out and .ci/run runs them apart
// (go test -tags sdk -run SDK ./gateway). Each of their tests says SDK in
// its name, so that run finds every one.
func TestSDKTestsAreTaggedAndNamed(t *testing.T) {
	sdks := []string{"github.com/openai/openai-go", "github.com/anthropics/anthropic-sdk-go"}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") {
			return err
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		uses := false
		for _, imp := range f.Imports {
			for _, sdk := range sdks {
				uses = uses || strings.HasPrefix(strings.Trim(imp.Path.Value, `"`), sdk)
			}
		}
		if !uses {
			return nil
		}
		tagged := len(f.Comments) > 0 && f.Comments[0].Pos() < f.Package &&
			strings.HasPrefix(f.Comments[0].List[0].Text, "//go:build sdk")
		if !strings.HasSuffix(path, "_test.go") || !tagged {
			t.Errorf("%s imports an SDK: only a _test.go file under //go:build sdk may", path)
		}
		for _, decl := range f.Decls {
			if fn, ok := decl.(*ast.FuncDecl); ok && fn.Recv == nil && strings.HasPrefix(fn.Name.Name, "Test") && !strings.Contains(fn.Name.Name, "SDK") {
				t.Errorf("%s: %s runs under the sdk tag but has no SDK in its name: .ci/run would not run it", path, fn.Name.Name)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
