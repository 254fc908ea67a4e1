package testenv

import (
	"bufio"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/ubkit-io/ubkit/internal/rundir"
)

// The test binary re-executed as the other user (TestOtherUser) reads these.
const (
	asOtherEnv     = "UBKIT_TESTENV_AS_OTHER" // "1" in the child
	otherDirEnv    = "UBKIT_TESTENV_OTHER_DIR"
	otherReportTag = "otheruser: "
)

func TestOtherUser(t *testing.T) {
	if os.Getenv(asOtherEnv) == "1" {
		reportAsOther(t, os.Getenv(otherDirEnv))
		return
	}
	u := OtherUser(t)
	if u.UID == 0 || u.UID == os.Geteuid() || u.GID == 0 {
		t.Fatalf("OtherUser() = %+v: not another unprivileged user", u)
	}
	dir := publicDir(t)
	if err := os.WriteFile(filepath.Join(dir, "public"), []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "secret"), []byte("root only"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := u.Command(t, "^TestOtherUser$", asOtherEnv+"=1", otherDirEnv+"="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("running the test binary as %s: %v; output:\n%s", u.Name, err, out)
	}
	got := otherReport(string(out))
	t.Logf("as %s: %s", u.Name, got)
	want := fmt.Sprintf("euid=%d uid=%d egid=%d groups=[] home-owner=%d public=hello secret=permission denied",
		u.UID, u.UID, u.GID, u.UID)
	if got != want {
		t.Fatalf("the test binary run as %s reports\n%q\nwant\n%q\noutput:\n%s", u.Name, got, want, out)
	}
}

// reportAsOther is TestOtherUser's child: it prints who it runs as and what
// it can read in dir.
func reportAsOther(t *testing.T, dir string) {
	groups, err := os.Getgroups()
	if err != nil {
		t.Fatal(err)
	}
	homeOwner := -1
	if fi, err := os.Stat(os.Getenv("HOME")); err == nil {
		homeOwner = rundir.Owner(fi)
	}
	public, err := os.ReadFile(filepath.Join(dir, "public"))
	if err != nil {
		public = []byte(err.Error())
	}
	secret := "read"
	if _, err := os.ReadFile(filepath.Join(dir, "secret")); err != nil {
		secret = err.(*os.PathError).Err.Error()
	}
	fmt.Printf("%seuid=%d uid=%d egid=%d groups=%v home-owner=%d public=%s secret=%s\n", otherReportTag,
		os.Geteuid(), os.Getuid(), os.Getegid(), groups, homeOwner, public, secret)
}

// otherReport returns the line reportAsOther printed, without its tag.
func otherReport(out string) string {
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if line, ok := strings.CutPrefix(sc.Text(), otherReportTag); ok {
			return line
		}
	}
	return ""
}

// publicDir makes a directory every user may enter and read, removed when
// the test ends (t.TempDir() is private to the user running the tests).
func publicDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "ubkit-testenv-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestOtherUserCleanup shows that the user, its home and the copy of the
// test binary are gone when the test that made them ends.
func TestOtherUserCleanup(t *testing.T) {
	var u *User
	var exe, home string
	t.Run("user", func(t *testing.T) {
		u = OtherUser(t)
		cmd := u.Command(t, "^$")
		exe = cmd.Path
		home = strings.TrimPrefix(cmd.Env[1], "HOME=")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("running the test binary as %s: %v; output:\n%s", u.Name, err, out)
		}
		if _, err := user.Lookup(u.Name); err != nil {
			t.Fatalf("user %s while its test runs: %v", u.Name, err)
		}
	})
	if _, err := user.Lookup(u.Name); !isUnknownUser(err) {
		t.Errorf("user %s after its test ended: lookup gives %v, want an unknown user", u.Name, err)
	}
	if _, err := user.LookupGroup(u.Name); err == nil {
		t.Errorf("group %s still exists after its test ended", u.Name)
	}
	for _, path := range []string{filepath.Dir(exe), home} {
		if _, err := os.Stat(path); !os.IsNotExist(err) {
			t.Errorf("%s after the test ended: %v, want it gone", path, err)
		}
	}
}

// TestOtherUserCommandsShareBinary shows that commands of one test share
// one copy of the test binary.
func TestOtherUserCommandsShareBinary(t *testing.T) {
	u := OtherUser(t)
	a, b := u.Command(t, "^$"), u.Command(t, "^$")
	if a.Path != b.Path {
		t.Errorf("two commands run %s and %s, want one copy", a.Path, b.Path)
	}
	fi, err := os.Stat(filepath.Dir(a.Path))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o755 {
		t.Errorf("the copy's directory has mode %v, want 0755", fi.Mode().Perm())
	}
}

func TestSweepUsers(t *testing.T) {
	OtherUser(t) // sweeps this process's own leftovers before the test makes its own
	dead := fmt.Sprintf("%s%d-1", userPrefix, deadPid(t))
	live := fmt.Sprintf("%s%d-%d", userPrefix, os.Getpid(), userCount.Add(1))
	for _, name := range []string{dead, live} {
		if _, err := userCmd("useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group", name); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := deleteUser(name); err != nil {
				t.Error(err)
			}
		})
	}
	deadDir := filepath.Join(os.TempDir(), fmt.Sprintf("%s%d-x", binPrefix, deadPid(t)))
	if err := os.Mkdir(deadDir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(deadDir) })

	removed, err := SweepUsers()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(removed, dead) || !slices.Contains(removed, deadDir) || slices.Contains(removed, live) {
		t.Errorf("SweepUsers() removed %q; want %s and %s removed and %s kept", removed, dead, deadDir, live)
	}
	if _, err := user.Lookup(dead); !isUnknownUser(err) {
		t.Errorf("user %s of a dead process after the sweep: %v", dead, err)
	}
	if _, err := user.Lookup(live); err != nil {
		t.Errorf("user %s of this live process after the sweep: %v", live, err)
	}
	if _, err := os.Stat(deadDir); !os.IsNotExist(err) {
		t.Errorf("%s after the sweep: %v, want it gone", deadDir, err)
	}
}

func TestOtherUserFromEnv(t *testing.T) {
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(OtherUserEnv, nobody.Uid)
	u := OtherUser(t)
	if strconv.Itoa(u.UID) != nobody.Uid || strconv.Itoa(u.GID) != nobody.Gid || u.Name != "nobody" {
		t.Errorf("OtherUser() with %s=%s = %+v, want nobody's uid and gid", OtherUserEnv, nobody.Uid, u)
	}
	for _, bad := range []string{"0", "-1", "x", strconv.Itoa(os.Geteuid())} {
		if _, err := existingUser(bad); err == nil {
			t.Errorf("%s=%s accepted", OtherUserEnv, bad)
		}
	}
}

func TestParseUserName(t *testing.T) {
	tests := []struct {
		name string
		pid  int
		ok   bool
	}{
		{"ubkit-t123-4", 123, true},
		{"ubkit-t123", 0, false},
		{"ubkit-t0-1", 0, false},
		{"ubkit-tx-1", 0, false},
		{"ubkit-t12-x", 0, false},
		{"ubkit-123-4", 0, false},
		{"root", 0, false},
	}
	for _, tt := range tests {
		pid, ok := parseUserName(tt.name)
		if pid != tt.pid || ok != tt.ok {
			t.Errorf("parseUserName(%q) = %d, %v; want %d, %v", tt.name, pid, ok, tt.pid, tt.ok)
		}
	}
}

func TestOtherUserProblem(t *testing.T) {
	if got := otherUserProblem(0, true); got != "" {
		t.Errorf("root with the tools: %q", got)
	}
	if got := otherUserProblem(1000, true); !strings.Contains(got, "needs root to create a throwaway user, or set "+OtherUserEnv) {
		t.Errorf("not root: %q does not name the prerequisite", got)
	}
	if got := otherUserProblem(0, false); !strings.Contains(got, "Debian package passwd") {
		t.Errorf("no useradd: %q does not name the package", got)
	}
}
