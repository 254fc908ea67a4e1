//go:build linux

package rundir

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"testing/fstest"
)

// otherUID owns what these tests plant in another user's name (root gives
// it away with chown; transport's and shm's tests plant as a real other
// user).
const otherUID = 65534

// isolate makes Dir's defaults fresh directories: TMPDIR a sticky,
// world-writable directory like /tmp, HOME a private one, no overrides and
// no /run/user/<uid>.
func isolate(t *testing.T) (tmp, home string) {
	t.Helper()
	tmp, err := os.MkdirTemp("", "ubkit-rundir-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	if err := os.Chmod(tmp, 0o777|fs.ModeSticky); err != nil {
		t.Fatal(err)
	}
	home = t.TempDir()
	t.Setenv("TMPDIR", tmp)
	t.Setenv("HOME", home)
	for _, v := range []string{Env, "XDG_RUNTIME_DIR", "XDG_CACHE_HOME"} {
		t.Setenv(v, "")
		os.Unsetenv(v)
	}
	saved := RunUser
	RunUser = filepath.Join(tmp, "run-user")
	t.Cleanup(func() { RunUser = saved })
	return tmp, home
}

func uid() string { return strconv.Itoa(os.Geteuid()) }

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test plants directories of another user with chown: run it as root (`make test` does)")
	}
}

// mustDir checks that Dir chooses want, and made it if made is set.
func mustDir(t *testing.T, want string, made bool) {
	t.Helper()
	got, err := Dir()
	if err != nil || got != want {
		t.Fatalf("Dir() = %q, %v; want %q", got, err, want)
	}
	if err := Check(got); made && err != nil {
		t.Fatalf("Dir() returned an unusable directory: %v", err)
	}
	if l := Lookup(); l != want {
		t.Fatalf("Lookup() = %q after Dir() = %q", l, want)
	}
}

func TestDirOrder(t *testing.T) {
	tmp, _ := isolate(t)
	// /run/user/<uid> counts only if private.
	runUser := filepath.Join(RunUser, uid())
	if err := os.MkdirAll(runUser, 0o755); err != nil {
		t.Fatal(err)
	}
	if got := Lookup(); got != filepath.Join(tmp, "ubkit-"+uid()) {
		t.Errorf("with /run/user/<uid> of mode 0755: Lookup() = %q, want the TMPDIR default", got)
	}
	if err := os.Chmod(runUser, 0o700); err != nil {
		t.Fatal(err)
	}
	mustDir(t, filepath.Join(runUser, "ubkit"), false)
	xdg := t.TempDir()
	t.Setenv("XDG_RUNTIME_DIR", xdg)
	mustDir(t, filepath.Join(xdg, "ubkit"), false)
	t.Setenv(Env, filepath.Join(xdg, "mine"))
	if got, err := Dir(); err != nil || got != filepath.Join(xdg, "mine") {
		t.Errorf("with %s set: Dir() = %q, %v", Env, got, err)
	}
}

func TestDirTmp(t *testing.T) {
	tmp, home := isolate(t)
	want := filepath.Join(tmp, "ubkit-"+uid())
	if got := Lookup(); got != want {
		t.Fatalf("Lookup() = %q, want %q", got, want)
	}
	if _, err := os.Lstat(want); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Lookup created %s: %v", want, err)
	}
	mustDir(t, want, true)
	if fi, _ := os.Lstat(want); fi.Mode().Perm() != 0o700 {
		t.Errorf("%s has mode %v, want 0700", want, fi.Mode().Perm())
	}
	if _, err := os.Lstat(filepath.Join(home, ".cache", "ubkit", "run")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the fallback was made although nobody squatted: %v", err)
	}
}

// Every way another user can hold <tmp>/ubkit-<uid>, and a temporary
// directory where others could rename it: Dir falls back to the cache
// directory, and stays there once the squatter leaves.
func TestDirSquatted(t *testing.T) {
	needRoot(t)
	for name, squat := range map[string]func(path string) error{
		"dir of another user": func(p string) error { return mkdirOwned(p, otherUID) },
		"symlink": func(p string) error {
			if err := os.Symlink(os.TempDir(), p); err != nil {
				return err
			}
			return os.Lchown(p, otherUID, otherUID)
		},
		"file": func(p string) error { return os.WriteFile(p, nil, 0o600) },
		"writable by others": func(p string) error {
			if err := os.Mkdir(p, 0o700); err != nil {
				return err
			}
			return os.Chmod(p, 0o777)
		},
		"tmp not sticky": func(p string) error { return os.Chmod(filepath.Dir(p), 0o777) },
	} {
		t.Run(name, func(t *testing.T) {
			tmp, home := isolate(t)
			path := filepath.Join(tmp, "ubkit-"+uid())
			if err := squat(path); err != nil {
				t.Fatal(err)
			}
			fallback := filepath.Join(home, ".cache", "ubkit", "run")
			if got := Lookup(); got != fallback {
				t.Fatalf("Lookup() = %q before the fallback exists, want %q", got, fallback)
			}
			mustDir(t, fallback, true)
			// The squatter leaves; the choice stays.
			os.RemoveAll(path)
			os.Chmod(tmp, 0o777|fs.ModeSticky)
			mustDir(t, fallback, true)
			if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("Dir made %s after it fell back: %v", path, err)
			}
		})
	}
}

// Without a home there is no fallback: the TMPDIR default still works
// when free, and a squatted one is a clear error.
func TestDirNoHome(t *testing.T) {
	needRoot(t)
	tmp, _ := isolate(t)
	t.Setenv("HOME", "")
	os.Unsetenv("HOME")
	path := filepath.Join(tmp, "ubkit-"+uid())
	mustDir(t, path, true)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := mkdirOwned(path, otherUID); err != nil {
		t.Fatal(err)
	}
	_, err := Dir()
	if !errors.Is(err, ErrNotPrivate) || !strings.Contains(err.Error(), "belongs to uid 65534") || !strings.Contains(err.Error(), Env) {
		t.Errorf("Dir() with a squatted default and no home: %v; want an error that names the owner and %s", err, Env)
	}
}

func TestCheck(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	mine := filepath.Join(dir, "mine")
	if err := Ensure(mine, "a", "b"); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{mine, filepath.Join(mine, "a"), filepath.Join(mine, "a", "b")} {
		if err := Check(d); err != nil {
			t.Errorf("Check(%s) after Ensure: %v", d, err)
		}
	}
	if err := Check(filepath.Join(dir, "none")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Check of a missing directory: %v", err)
	}
	other := filepath.Join(dir, "other")
	if err := mkdirOwned(other, otherUID); err != nil {
		t.Fatal(err)
	}
	if err := Ensure(other); !errors.Is(err, ErrNotPrivate) {
		t.Errorf("Ensure of another user's directory: %v", err)
	}
}

// TestOwner: Owner names who owns a file, a symbolic link itself
// included, and -1 for a FileInfo the system did not make.
func TestOwner(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	link := filepath.Join(dir, "link")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(link, otherUID, otherUID); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]int{dir: os.Geteuid(), link: otherUID} {
		fi, err := os.Lstat(path)
		if err != nil {
			t.Fatal(err)
		}
		if got := Owner(fi); got != want {
			t.Errorf("Owner(%s) = %d, want %d", path, got, want)
		}
	}
	fsys := fstest.MapFS{"f": {}}
	fi, err := fs.Stat(fsys, "f")
	if err != nil {
		t.Fatal(err)
	}
	if got := Owner(fi); got != -1 {
		t.Errorf("Owner of a file of an in-memory file system = %d, want -1", got)
	}
}

func TestCheckSocketPath(t *testing.T) {
	if err := CheckSocketPath("/" + strings.Repeat("a", SocketPathMax-1)); err != nil {
		t.Errorf("a path of %d bytes: %v", SocketPathMax, err)
	}
	if err := CheckSocketPath("/" + strings.Repeat("a", SocketPathMax)); err == nil || !strings.Contains(err.Error(), Env) {
		t.Errorf("a path of %d bytes: %v; want an error naming %s", SocketPathMax+1, err, Env)
	}
}

func mkdirOwned(path string, uid int) error {
	if err := os.Mkdir(path, 0o755); err != nil {
		return err
	}
	return os.Chown(path, uid, uid)
}

// Lock excludes a second holder until the first releases it, across
// processes' descriptors too (flock is per open file).
func TestLock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	unlock, err := Lock(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); !errors.Is(err, syscall.EWOULDBLOCK) {
		t.Fatalf("a second lock while held: %v, want EWOULDBLOCK", err)
	}
	unlock()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatalf("a second lock after unlock: %v", err)
	}
}
