package sizes

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// The limits, in lines (the package doc says why these and how lines are
// counted). A file, function or package of exactly the limit passes.
const (
	MaxFileLines    = 600
	MaxFuncLines    = 100
	MaxPackageLines = 4000
)

// Kind says which limit a Violation breaks.
type Kind int

const (
	File    Kind = iota // a file over MaxFileLines
	Func                // a function or method over MaxFuncLines
	Package             // a directory over MaxPackageLines
)

// Violation is one file, function or package over its limit.
type Violation struct {
	Kind  Kind
	Path  string // slash-separated, relative to the root Check was given: the file, or for Package the directory ("." for the root)
	Line  int    // Func: the line of the func keyword; 0 otherwise
	Name  string // Func: the function's name, Recv.Name for a method; "" otherwise
	Lines int    // how long it is
}

// Limit is the most lines the violation's kind allows.
func (v Violation) Limit() int {
	switch v.Kind {
	case File:
		return MaxFileLines
	case Func:
		return MaxFuncLines
	default:
		return MaxPackageLines
	}
}

func (v Violation) String() string {
	switch v.Kind {
	case File:
		return fmt.Sprintf("%s: file has %d lines, over %d", v.Path, v.Lines, v.Limit())
	case Func:
		return fmt.Sprintf("%s:%d: func %s has %d lines, over %d", v.Path, v.Line, v.Name, v.Lines, v.Limit())
	default:
		return fmt.Sprintf("%s: package has %d lines in non-test files, over %d", v.Path, v.Lines, v.Limit())
	}
}

// Check walks the directory tree under root and returns every file,
// function and package over its limit, directory by directory in
// filepath.WalkDir's lexical order (a directory before its subdirectories):
// a directory's files in name order, a file's own violation before its
// functions', then the directory's sum. A Go file that does not parse is an
// error.
func Check(root string) ([]Violation, error) {
	var out []Violation
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if path != root && skipDir(d.Name()) {
			return filepath.SkipDir
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		vs, err := checkDir(path, filepath.ToSlash(rel))
		out = append(out, vs...)
		return err
	})
	return out, err
}

// skipDir reports whether the go tool ignores a directory of this name.
func skipDir(name string) bool {
	return strings.HasPrefix(name, "_") || strings.HasPrefix(name, ".") || name == "testdata"
}

// checkDir checks the Go files directly inside dir, which is rel from the
// root, and their sum.
func checkDir(dir, rel string) ([]Violation, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []Violation
	sum := 0
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		vs, lines, err := checkFile(filepath.Join(dir, name), pathJoin(rel, name))
		if err != nil {
			return out, err
		}
		out = append(out, vs...)
		sum += lines
	}
	if sum > MaxPackageLines {
		out = append(out, Violation{Kind: Package, Path: rel, Lines: sum})
	}
	return out, nil
}

// checkFile checks one non-test file and returns its lines for the
// package's sum: 0 for a generated file, which is not checked.
func checkFile(path, rel string) ([]Violation, int, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, 0, err
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, src, parser.ParseComments|parser.SkipObjectResolution)
	if err != nil {
		return nil, 0, err
	}
	if ast.IsGenerated(f) {
		return nil, 0, nil
	}
	var out []Violation
	lines := countLines(src)
	if lines > MaxFileLines {
		out = append(out, Violation{Kind: File, Path: rel, Lines: lines})
	}
	for _, decl := range f.Decls {
		fn, ok := decl.(*ast.FuncDecl)
		if !ok {
			continue
		}
		first := fset.Position(fn.Pos()).Line // the func keyword; the doc comment is not fn.Pos()
		last := fset.Position(fn.End()).Line
		if fn.Body != nil {
			last = fset.Position(fn.Body.Rbrace).Line
		}
		if n := last - first + 1; n > MaxFuncLines {
			out = append(out, Violation{Kind: Func, Path: rel, Line: first, Name: funcName(fn), Lines: n})
		}
	}
	return out, lines, nil
}

// countLines is the number of lines an editor shows: one per newline, and
// one more for text after the last newline.
func countLines(src []byte) int {
	n := bytes.Count(src, []byte("\n"))
	if len(src) > 0 && src[len(src)-1] != '\n' {
		n++
	}
	return n
}

// funcName is Name for a function and Recv.Name for a method (Recv without
// its pointer or type parameters).
func funcName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	t := fn.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	switch x := t.(type) {
	case *ast.IndexExpr:
		t = x.X
	case *ast.IndexListExpr:
		t = x.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name + "." + fn.Name.Name
	}
	return fn.Name.Name
}

// pathJoin joins slash-separated relative paths, "." being the root.
func pathJoin(dir, name string) string {
	if dir == "." {
		return name
	}
	return dir + "/" + name
}
