package imgctx_test

import (
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

// allowed is the import table of DESIGN.md: for each package, the packages
// of this module it may import. Storage and media never import chat; the
// conversation model imports no I/O package of ours. A new package must be
// added here deliberately.
var allowed = map[string][]string{
	"":                     {},
	"blob":                 {},
	"reason":               {},
	"mimetype":             {},
	"chat":                 {"blob", "mimetype"},
	"imagestore":           {"blob"},
	"imagestore/storetest": {"blob", "imagestore"},
	"media":                {"blob", "mimetype", "reason"},
	"tokens":               {"blob", "chat"},
	"policy":               {"blob", "chat", "mimetype", "reason", "tokens"},
	"session":              {"blob", "chat", "imagestore", "policy", "reason"},
	"session/sessiontest":  {"blob", "chat", "policy", "session"},
	"session/sqlite":       {"chat", "imagestore", "session"},
	"session/postgres":     {"chat", "imagestore", "session"},
	"imagestore/s3":        {"blob", "imagestore"},
	"internal/testsvc":     {},
	"sim":                  {"chat", "engine", "gateway", "imagestore", "session", "tokens", "upstream", "wire", "wire/anthropic", "wire/gemini", "wire/jsonspan", "wire/openai", "wire/responses"},
	"wire":                 {"blob", "chat", "mimetype", "wire/jsonspan"},
	"wire/jsonspan":        {},
	"wire/wiretest":        {"chat", "wire"},
	"wire/openai":          {"chat", "wire", "wire/jsonspan"},
	"wire/responses":       {"chat", "wire", "wire/jsonspan", "wire/openai"},
	"wire/gemini":          {"chat", "wire", "wire/jsonspan"},
	"wire/anthropic":       {"chat", "wire", "wire/jsonspan"},
	"upstream":             {"wire", "wire/anthropic", "wire/gemini", "wire/openai"},
	"engine":               {"blob", "chat", "imagestore", "media", "policy", "reason", "session", "tokens", "upstream", "wire", "wire/anthropic", "wire/openai"},
	"gateway":              {"blob", "chat", "engine", "imagestore", "media", "policy", "reason", "session", "tokens", "upstream", "wire", "wire/anthropic", "wire/gemini", "wire/openai", "wire/responses"},
	"internal/config":      {"imagestore", "media", "policy", "tokens"},
	"scripts/abmeter":      {"internal/bodies"},
	"scripts/agentcheck":   {},
	"scripts/attack":       {},
	"internal/bodies":      {},
	"cmd/imgctx":           {"blob", "chat", "engine", "gateway", "imagestore", "internal/config", "media", "mimetype", "policy", "reason", "imagestore/s3", "session", "session/postgres", "session/sqlite", "sim", "tokens", "upstream"},
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
	for pkg := range allowed {
		if !seen[pkg] {
			t.Errorf("import table lists %q, which has no Go files", pkg)
		}
	}
	if _, err := os.Stat("go.mod"); err != nil {
		t.Fatal("run from the module root")
	}
}
