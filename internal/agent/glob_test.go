package agent

import "testing"

func TestGlobDoubleStar(t *testing.T) {
	for _, c := range []struct {
		glob, rel string
		want      bool
	}{
		{"*.ts", "a.ts", true}, {"*.ts", "src/a.ts", true}, {"*.ts", "a.js", false},
		{"**/*.ts", "a.ts", true}, {"**/*.ts", "src/lib/b.ts", true}, {"**/*.ts", "src/lib/b.js", false},
		{"src/**", "src", true}, {"src/**", "src/x/y", true}, {"src/**", "lib/x", false},
		{"src/**/test/*.go", "src/test/a.go", true}, {"src/**/test/*.go", "src/a/b/test/a.go", true},
		{"src/**/test/*.go", "src/a/b/test/x/a.go", false}, {"src/*.go", "src/a/b.go", false},
		{"**", "anything/at/all", true}, {"a/**/**/b", "a/b", true}, {"a/[bc]/d", "a/c/d", true},
	} {
		if got := keep(c.rel, c.glob); got != c.want {
			t.Errorf("keep(%q, %q) = %v, want %v", c.rel, c.glob, got, c.want)
		}
	}
}
