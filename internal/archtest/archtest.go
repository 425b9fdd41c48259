// Package archtest checks the shape of the code that the compiler does not:
// modules never import a transport, a module's SQL names only the tables
// that module owns, the root tenant's id is spelled only in iam, and no
// production function is over MaxFuncLines lines. Its
// test runs Check over the repository in the test command, so a change that
// breaks one of these rules fails with the file and line that broke it.
//
// It reads source with go/parser only (no type checking), so it is fast
// and needs no build.
package archtest

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// Transports are the packages that face the network: modules sit below
// them and never import them.
var Transports = []string{"internal/api", "internal/gateway", "internal/server"}

// Top are the packages allowed to import a transport: the transports
// themselves and what assembles or drives them (commands, dev and test
// harnesses).
var Top = []string{
	"internal/api", "internal/gateway", "internal/server", "internal/cli", "internal/bcdcli",
	"internal/devenv", "internal/fleetsim", "internal/testenv", "internal/integration", "internal/e2e",
}

// RootOwner is the one package that may spell the root tenant's id.
const RootOwner = "internal/iam"

// NotTenantMarker on a line excuses a "root" literal there that is not a
// tenant id (a directory name, a flag name).
const NotTenantMarker = "archtest:not-tenant"

// AttackerMarker on a line of a harness package (Harnesses) excuses SQL
// there on another module's table: the harness plays an attacker who holds
// the database's credentials (a forged row the node must refuse), which no
// module API may offer.
const AttackerMarker = "archtest:plays-attacker"

// Harnesses are the packages whose SQL may carry AttackerMarker.
var Harnesses = []string{"internal/testenv"}

// MaxFuncLines is the longest a production function in internal/ may be,
// from its func line to its closing brace.
const MaxFuncLines = 80

// RegistrationTables are the functions allowed to be longer: flat tables
// that register one entry per line (the API's method tables), which read
// best whole. Keyed "package dir.function".
var RegistrationTables = map[string]bool{
	"internal/api.Methods":        true,
	"internal/api.iamMethods":     true,
	"internal/api.sandboxMethods": true,
}

// Violation is one broken rule, at a file and line relative to the root.
type Violation struct {
	File string
	Line int
	Rule string // "transport-import", "foreign-table", "root-literal" or "long-function"
	Msg  string
}

func (v Violation) String() string {
	return fmt.Sprintf("%s:%d: %s: %s", v.File, v.Line, v.Rule, v.Msg)
}

var (
	createTable = regexp.MustCompile(`(?i)CREATE TABLE(?: IF NOT EXISTS)?\s+(\w+)`)
	sqlVerb     = regexp.MustCompile(`\b(SELECT|INSERT|UPDATE|DELETE|CREATE|ALTER|WITH)\b`)
	tableRef    = regexp.MustCompile(`\b(?:FROM|JOIN|INTO|UPDATE|TABLE|EXISTS)\s+(\w+)`)
)

// Owners maps every table to the module that creates it: the directory
// above the migrations directory that holds its CREATE TABLE.
func Owners(root string) (map[string]string, error) {
	files, err := filepath.Glob(filepath.Join(root, "internal", "*", "migrations", "*.sql"))
	if err != nil {
		return nil, fmt.Errorf("archtest: list migrations: %w", err)
	}
	owners := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("archtest: %w", err)
		}
		module := "internal/" + filepath.Base(filepath.Dir(filepath.Dir(f)))
		for _, m := range createTable.FindAllStringSubmatch(string(b), -1) {
			owners[strings.ToLower(m[1])] = module
		}
	}
	return owners, nil
}

// Check walks the Go files (not tests, not testdata) under root/internal
// and returns every violation, sorted by position.
func Check(root string) ([]Violation, error) {
	owners, err := Owners(root)
	if err != nil {
		return nil, err
	}
	modPath, err := modulePath(root)
	if err != nil {
		return nil, err
	}
	var out []Violation
	err = filepath.WalkDir(filepath.Join(root, "internal"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == "testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		vs, err := checkFile(filepath.ToSlash(rel), p, modPath, owners)
		out = append(out, vs...)
		return err
	})
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].File != out[j].File {
			return out[i].File < out[j].File
		}
		return out[i].Line < out[j].Line
	})
	return out, err
}

func checkFile(rel, full, modPath string, owners map[string]string) ([]Violation, error) {
	fset := token.NewFileSet()
	src, err := os.ReadFile(full)
	if err != nil {
		return nil, fmt.Errorf("archtest: %w", err)
	}
	f, err := parser.ParseFile(fset, full, src, parser.ParseComments)
	if err != nil {
		return nil, fmt.Errorf("archtest: %w", err)
	}
	pkg := path.Dir(rel)
	lines := strings.Split(string(src), "\n")
	var out []Violation
	at := func(p token.Pos) (string, int) { return rel, fset.Position(p).Line }
	if !under(pkg, Top) {
		for _, imp := range f.Imports {
			ip, _ := strconv.Unquote(imp.Path.Value)
			if t := strings.TrimPrefix(ip, modPath+"/"); t != ip && under(t, Transports) {
				file, line := at(imp.Pos())
				out = append(out, Violation{file, line, "transport-import", pkg + " imports the transport " + t})
			}
		}
	}
	out = append(out, longFuncs(f, fset, rel, pkg)...)
	module := moduleOf(pkg)
	ast.Inspect(f, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.BasicLit:
			if x.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(x.Value)
			if err != nil {
				return true
			}
			file, line := at(x.Pos())
			if s == "root" && !under(pkg, []string{RootOwner}) && !strings.Contains(lines[line-1], NotTenantMarker) { // archtest:not-tenant (the rule itself)
				out = append(out, Violation{file, line, "root-literal", `"root" outside iam: use iam.RootTenant or iam.Scope`})
			}
			if !(under(pkg, Harnesses) && strings.Contains(lines[line-1], AttackerMarker)) {
				out = append(out, foreignTables(s, module, owners, file, line)...)
			}
		}
		return true
	})
	return out, nil
}

// longFuncs reports the functions of f over MaxFuncLines lines, but for
// the registration tables. Generated files (.pb.go) are not checked.
func longFuncs(f *ast.File, fset *token.FileSet, rel, pkg string) []Violation {
	if strings.HasSuffix(rel, ".pb.go") {
		return nil
	}
	var out []Violation
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Body == nil || RegistrationTables[pkg+"."+fd.Name.Name] {
			continue
		}
		start, end := fset.Position(fd.Pos()).Line, fset.Position(fd.End()).Line
		if n := end - start + 1; n > MaxFuncLines {
			out = append(out, Violation{rel, start, "long-function", fmt.Sprintf("%s is %d lines (at most %d): split it along read, decide, write", fd.Name.Name, n, MaxFuncLines)})
		}
	}
	return out
}

// foreignTables reports the tables an SQL-looking literal names that a
// module other than module owns.
func foreignTables(s, module string, owners map[string]string, file string, line int) []Violation {
	if !sqlVerb.MatchString(s) {
		return nil
	}
	var out []Violation
	seen := map[string]bool{}
	for _, m := range tableRef.FindAllStringSubmatch(s, -1) {
		t := strings.ToLower(m[1])
		owner, known := owners[t]
		if !known || owner == module || seen[t] {
			continue
		}
		seen[t] = true
		out = append(out, Violation{file, line, "foreign-table", fmt.Sprintf("%s names table %s, owned by %s", module, t, owner)})
	}
	return out
}

// moduleOf is the module a package belongs to: internal/<name>, for the
// package and its subpackages.
func moduleOf(pkg string) string {
	parts := strings.SplitN(pkg, "/", 3)
	if len(parts) < 2 {
		return pkg
	}
	return parts[0] + "/" + parts[1]
}

func under(pkg string, roots []string) bool {
	for _, r := range roots {
		if pkg == r || strings.HasPrefix(pkg, r+"/") {
			return true
		}
	}
	return false
}

func modulePath(root string) (string, error) {
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return "", fmt.Errorf("archtest: %w", err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "module ") {
			return strings.TrimSpace(strings.TrimPrefix(l, "module ")), nil
		}
	}
	return "", fmt.Errorf("archtest: no module line in go.mod")
}
