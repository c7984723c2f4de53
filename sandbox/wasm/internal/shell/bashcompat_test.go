package shell

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"testing"
	"time"
)

// bashScripts are run by this shell and by the host's bash (in an empty
// directory), and must print the same and exit the same: the interpreter
// is ours, the language is bash's.
var bashScripts = []string{
	// words, quoting, expansion
	`echo a  b "c  d" 'e  f' $'g\th'`,
	`x="a b  c"; echo $x; echo "$x"; printf '[%s]' $x; echo`,
	`x=; echo "[${x:-def}] [${x-def}] [${y:-u}] [${y-u}]"`,
	`x=hello; echo ${#x} ${x:1:3} ${x: -2} ${x^^} ${x^} ${x,,}`,
	`x=a.b.c.tar.gz; echo ${x%.*} ${x%%.*} ${x#*.} ${x##*.}`,
	`x=aXbXc; echo ${x/X/-} ${x//X/-} ${x/#a/A} ${x/%c/C}`,
	`set -- one "two three" four; echo $#; for a in "$@"; do echo "<$a>"; done; echo "$*"`,
	`set -- a b c; shift; echo "$@"; shift 2; echo "[$#]"`,
	`IFS=:; x=a:b::c; for f in $x; do echo "<$f>"; done`,
	`echo {a,b,c}{1,2} {1..5} {5..1..2} {a..e}`,
	`echo $((1+2*3)) $((10/3)) $((10%3)) $((2**10)) $(( (1<<4) | 1 )) $((0x10 + 010))`,
	`i=5; ((i++)); ((i+=10)); echo $i; echo $((i > 10 ? 1 : 0))`,
	`x=3; let "y = x * 2" z=y+1; echo $y $z`,
	`echo $(echo inner $(echo nested)) "$(printf 'a\nb\n\n')" end`,
	"echo `echo backticks`",
	`a=(one two three); echo ${a[1]} ${#a[@]} "${a[@]}" ${!a[@]}`,
	`a=(); a+=(x); a+=(y z); a[5]=w; echo "${a[@]}" ${#a[@]} ${!a[@]}`,
	`declare -A m; m[k1]=v1; m[k2]=v2; for k in $(printf '%s\n' "${!m[@]}" | sort); do echo $k=${m[$k]}; done`,
	`a=(x y z); unset 'a[1]'; echo "${a[@]}" ${#a[@]}`,
	`f() { local x=inner; echo $x; }; x=outer; f; echo $x`,
	`f() { echo "args: $# $1 $2"; return 3; }; f a b; echo "status $?"`,
	`f() { g; }; g() { echo "in g: ${FUNCNAME[0]} from ${FUNCNAME[1]}"; }; f`,
	`x=1; f() { x=2; }; f; echo $x`,
	`fact() { if [ $1 -le 1 ]; then echo 1; else echo $(( $1 * $(fact $(( $1 - 1 ))) )); fi; }; fact 10`,
	`readonly r=1; r=2; echo "after $?"`,
	`export E=1; sh -c 'echo "E=$E"'; NE=2 sh -c 'echo "NE=$NE"'; echo "NE=[$NE]"`,
	`x=1; (x=2; echo $x); echo $x`,
	`x=1; { x=2; }; echo $x`,
	`echo hi | { read l; echo "got $l"; }`,
	`printf 'a b c\nd e f\n' | while read x y; do echo "$y|$x"; done`,
	`printf 'a\\b\n' | { read -r l; echo "$l"; read l2; echo "[$l2] $?"; }`,
	`IFS=, read -r a b c <<< "1,2,3,4"; echo "$a $b $c"`,
	`read -a arr <<< "x y z"; echo ${arr[2]} ${#arr[@]}`,
	`mapfile -t lines < <(printf 'l1\nl2\nl3\n'); echo ${#lines[@]} ${lines[1]}`,
	`cat <<EOF
line $((1+1))
  indented
EOF
cat <<'EOF'
no $expansion here
EOF
cat <<-EOF
	tabs stripped
	EOF`,
	// control flow
	`for i in 1 2 3; do if [ $i = 2 ]; then continue; fi; echo $i; done`,
	`for ((i=0; i<3; i++)); do echo $i; done`,
	`i=0; while [ $i -lt 5 ]; do i=$((i+1)); [ $i -eq 4 ] && break; done; echo $i`,
	`i=0; until [ $i -ge 3 ]; do echo $i; i=$((i+1)); done`,
	`for i in 1 2; do for j in a b; do [ $j = b ] && continue 2; echo $i$j; done; done`,
	`case foo.txt in *.py) echo py;; *.txt|*.md) echo text;; *) echo other;; esac`,
	`case x in x) echo one;& y) echo two;; z) echo three;; esac`,
	`x=b; case $x in [a-c]) echo range;; esac`,
	`if false; then echo no; elif true; then echo elif; else echo else; fi`,
	`true && echo and; false || echo or; false && echo no; echo $?`,
	`! false; echo $?; ! true; echo $?`,
	`(exit 5); echo $?`,
	`set -e; false || true; echo still; false; echo never`,
	`set -e; f() { false; echo in-f; }; f || echo handled; echo after`,
	`set -e; if false; then :; fi; echo ok; x=$(false) || echo caught`,
	`set -u; echo ${unset_var:-fine}; echo $unset_var; echo never`,
	`set -o pipefail; false | true; echo $?; set +o pipefail; false | true; echo $?`,
	`trap 'echo bye $?' EXIT; echo hi; exit 4`,
	`trap 'echo err trap' ERR; false; echo next`,
	// tests
	`[ -z "" ] && [ -n x ] && [ a = a ] && [ a != b ] && echo strings`,
	`[ 3 -lt 5 -a 5 -gt 3 ] && echo and; [ 1 -eq 2 -o 2 -eq 2 ] && echo or; [ ! 1 -eq 2 ] && echo not`,
	`[[ abc == a* ]] && echo glob; [[ abc =~ ^a(b)c$ ]] && echo "re ${BASH_REMATCH[1]}"; [[ -z "" && ( 1 -lt 2 ) ]] && echo grouped`,
	`[[ 10 -gt 9 ]] && echo numeric; [[ b > a ]] && echo lexical; [[ x != y ]] && echo ne`,
	`touch f; mkdir d; [ -f f ] && [ -d d ] && [ -e f ] && [ ! -e nope ] && echo files; [ -s f ] || echo empty`,
	`echo data > f; [ -s f ] && echo nonempty; [ f -nt nope ] && echo newer`,
	`test 1 -eq 1; echo $?; test; echo $?; [ ]; echo $?`,
	// redirections and fds
	`echo out > f; echo more >> f; cat f; cat < f | wc -l`,
	`{ echo to-err >&2; echo to-out; } 2>/dev/null`,
	`{ echo e >&2; } 2>&1 | cat`,
	`echo x 1>&2 2>/dev/null; echo y`,
	`exec 3>f3; echo via3 >&3; exec 3>&-; cat f3`,
	`exec 4<<<"from here-string"; read -u 4 l; echo "$l"`,
	`ls nope 2>/dev/null || echo missing`,
	`echo abc > f; wc -c < f; cat < f > g; cat g`,
	`set -C; echo 1 > f; echo 2 > f; echo $?; echo 3 >| f; cat f`,
	`x=$(cat <<EOF
in $(echo subst)
EOF
); echo "$x"`,
	// builtins and commands
	`printf '%s-%d-%05.1f-%x-%o-%c-%%\n' str 42 3.14159 255 8 char`,
	`printf '%s\n' a b c; printf '%-5s|%5s|\n' ab cd`,
	`printf -v v '%03d' 7; echo $v`,
	`echo -n no-newline; echo; echo -e 'tab\there\nnew'; echo -E 'raw\t'`,
	`type echo; type cd; command -v printf; f() { :; }; type -t f`,
	`getopts_test() { while getopts "ab:c" o; do case $o in a) echo A;; b) echo "B=$OPTARG";; c) echo C;; *) echo bad;; esac; done; shift $((OPTIND-1)); echo "rest $*"; }; getopts_test -a -b val -c x y`,
	`eval 'x=evaluated; echo $x'; cmd='echo via variable'; $cmd`,
	`echo 'echo sourced $1' > s.sh; . ./s.sh arg; source ./s.sh other`,
	`x=5; declare -p x; declare -i n=3+4; echo $n`,
	`unset x; x=1; unset x; echo "[${x-unset}]"`,
	`alias ll='echo alias'; shopt -s expand_aliases; echo aliases-set`,
	`f() { return 7; }; f; echo $?; true; echo $?`,
	`echo $(( $(echo 3) + 4 ))`,
	`x=( $(echo 1 2 3) ); echo ${#x[@]}`,
	`str="hello world"; echo ${str// /_} ${str^^[lo]}`,
	`x=abc; echo ${x:0:1}${x:(-1)}`,
	`s="  trim me  "; s="${s#"${s%%[![:space:]]*}"}"; s="${s%"${s##*[![:space:]]}"}"; echo "[$s]"`,
	`v=ref_target; ref_target=42; echo ${!v}`,
	`pre_a=1 pre_b=2; echo ${!pre_@}`,
	`seq 3 | tac; seq 1 2 7 | paste -sd+ -`,
	`printf 'b\na\nc\na\n' | sort | uniq -c | sort -rn | head -1`,
	`echo "a,b,c" | cut -d, -f2; echo hello | tr a-z A-Z; echo hello | rev`,
	`printf 'x1\ny2\nx3\n' | grep -n x | sed 's/:/ -> /'`,
	`mkdir -p a/b/c; touch a/b/c/f.txt a/x.py; find a -type f | sort; find a -name '*.py'`,
	`echo one > f; cp f g; mv g h; ls; rm f h; ls | wc -l`,
	`printf '1\n2\n' > a; printf '1\n3\n' > b; diff a b; echo "status $?"`,
	`echo '{"k": 1}' | grep -o '"k"'; echo abc | sed -E 's/(a)(b)/\2\1/'`,
	`printf 'line1\nline2\n' > f; sed -i 's/line/LINE/' f; cat f; head -1 f; tail -n 1 f`,
	`echo "a b c" | xargs -n1 echo item`,
	`printf '%s\n' 3 1 2 | sort -n | tr '\n' ' '; echo`,
	`expr 2 + 3; expr 10 / 3; basename /a/b/c.txt .txt; dirname /a/b/c.txt`,
	`echo abc | md5sum; echo abc | sha256sum | cut -c1-16`,
	`x=0; for i in $(seq 100); do x=$((x+i)); done; echo $x`,
	`n=0; while read l; do n=$((n+1)); done < <(seq 10); echo $n`,
	`(echo sub; exit 3) | cat; echo "${PIPESTATUS[@]:-ps}"`,
	`echo $(( 7 / 2 )) $(( -7 / 2 )) $(( -7 % 2 ))`,
	`x=10; ((x > 5)) && echo big; ((x < 5)) || echo notsmall`,
	`f() { echo "$@"; }; f "$(printf 'a b')" c`,
	`echo "${#}" "${1-none}"`,
	`arr=(b a c); IFS=$'\n' sorted=($(sort <<<"${arr[*]}")); unset IFS; echo "${sorted[@]}"`,
	`x=$'multi\nline'; echo "$x" | wc -l`,
	`echo 'a"b'"c'd"; echo "\$HOME is not expanded: \\"`,
	`wait; sleep 0.01 & wait $!; echo "bg status $?"; (exit 9) & wait $!; echo $?`,
	`cd /; cd - >/dev/null; echo back`,
	`echo "${x:=assigned}"; echo $x`,
	`echo ${x:?"is unset"}; echo unreachable`,
	`time true 2>/dev/null; echo timed`,
	`echo $((0 ? 1 : 2)) $((3 == 3)) $((!0)) $((~0))`,
	`a="1 2"; b=(${a}); echo ${#b[@]}; c=("${a}"); echo ${#c[@]}`,
	`for f in *.nothing; do echo "[$f]"; done; shopt -s nullglob; for f in *.nothing; do echo "[$f]"; done; echo end`,
	`touch b.txt a.txt c.log; echo *.txt; echo [ab]*; echo ?.log`,
	`mkdir -p x/y; touch x/y/z.go x/w.go; shopt -s globstar; echo x/**/*.go`,
	`exit 300`,
	`exit`,
	`false; exit`,
	`return 2>/dev/null; echo "return at top: $?"`,
	`break 2>/dev/null; echo "break outside: $?"`,
	`x() { echo "a b" ; }; read p q < <(x); echo "$q $p"`,
	`echo stdout; echo stderr >&2; exit 3`,
	`nosuchcommand 2>/dev/null; echo $?`,
	`./nosuch 2>/dev/null; echo $?`,
	`echo '#!/bin/sh
echo script "$@"' > s; chmod +x s; ./s 1 2; sh s 3`,
	`f() { local -a l=(1 2 3); echo ${#l[@]}; }; f`,
	`declare -a arr=(x y); declare -A as=([a]=1); echo ${arr[1]} ${as[a]}`,
	`echo "${@:-no args}"`,
	`set -- a b c d; echo "${@:2}" "${@:2:1}" "${*: -1}"`,
	`printf '%s' "$(yes | head -3)" | wc -l`,
	`echo {01..03} {a,b}.{c,d}`,
	`i=0; while :; do ((i++ >= 3)) && break; done; echo $i`,
	`echo $(( 2#101 + 16#ff + 8#10 ))`,
	`x='*'; echo "$x" $x | head -c 1; echo`,
	`set -x; echo traced 2>/dev/null; set +x`,
	`echo $-`,
	`cat /dev/null; head -c 3 /dev/zero | wc -c`,
	// what agents type
	`mkdir -p src && cd src && printf 'def f():\n    return 1\n' > m.py && cd .. && grep -rn "return" src`,
	`cat > f.py << 'EOF'
import sys
print("hi", sys.argv)
EOF
wc -l f.py; head -n 1 f.py`,
	`printf 'a\nb\nc\nd\n' > f; sed -n '2,3p' f; sed '1d' f | head -1; grep -c . f`,
	`printf 'x=1\ny=2\n' > cfg; while IFS='=' read -r k v; do echo "$k -> $v"; done < cfg`,
	`echo "err" 1>&2 | cat; echo "$(echo out; echo err >&2)" 2>/dev/null`,
	`(cd / && echo in-sub) ; echo done`,
	`false || { echo recovered; true; }; echo $?`,
	`[ -f nothere ] || echo "no file"; [ -d . ] && echo "dir"`,
	`x=$(printf '%s\n' c b a | sort | head -n1); echo "first: $x"`,
	`for f in a b c; do echo $f > $f.txt; done; cat *.txt | tr '\n' ' '; echo; ls *.txt | wc -l`,
	`s="key: value"; echo "${s%%:*}" "${s#*: }"`,
	`nums=(3 1 2); total=0; for n in "${nums[@]}"; do total=$((total + n)); done; echo $total`,
	`echo "line with spaces" > "file name"; cat "file name"; ls "file name"`,
	`printf '%s\n' "a b" "c d" | while read -r line; do echo "[$line]"; done`,
	`echo $(( $(printf '1\n2\n3\n' | wc -l) * 2 ))`,
	`v=$(echo "  padded  "); echo "[$v]"; echo "[${v// /}]"`,
	`set -euo pipefail; arr=(a b); echo "${arr[@]}"; echo "${#arr[@]}"`,
	`command -v cat >/dev/null && echo has-cat`,
	`echo a b c | awk_missing 2>/dev/null; echo "rc=$?"`,
	`i=0; while read -r l; do ((i++)) || true; done <<< "$(seq 5)"; echo $i`,
	`f() { local n=$1; (( n <= 1 )) && { echo 1; return; }; echo $(( n * $(f $((n-1))) )); }; f 5`,
	`a=1; b=2; [[ $a -lt $b && $b -gt 0 ]] && echo "both"; [[ ! -e nope ]] && echo "absent"`,
	`echo "tab	sep" | cut -f2`,
	`echo -e "b\na\nb" | sort -u`,
	`printf '%5.2f|%-6s|%+d|%x\n' 3.14159 ab 5 255; printf '%s=%s\n' k1 v1 k2 v2`,
	`printf "%b\n" 'a\tb'; printf '%q\n' "it's"`,
	`x='a\nb'; echo "$x"; echo -e "$x"`,
	`echo $((RANDOM >= 0))`,
	`seq 5 | head -2 | tail -1; seq 10 | grep -v 1 | tr '\n' ,; echo`,
	`true | false | true; echo "${PIPESTATUS[*]}"`,
	`exec 2>/dev/null; echo visible; echo hidden >&2`,
	`{ echo a; echo b; } > out; cat out | sort -r`,
	`echo foo > f; exec 3< f; read -u 3 x; exec 3<&-; echo "read $x"`,
	`echo hello world | sed 's/\(hello\) \(world\)/\2 \1/'`,
	`echo "a.b.c" | tr . '\n' | wc -l`,
	`printf 'k v\n' | { read k v; printf '%s\n' "$v"; }`,
	`case "$(echo yes)" in y*) echo matched;; esac`,
	`for i in {1..3}; do for j in {1..3}; do (( i == j )) && echo $i$j; done; done`,
	`echo ${HOME}; echo ~; echo ~/x; echo "~"; echo ~nosuchuser`,
}

func TestTheShellMatchesBash(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("bash not found; the compatibility test needs it")
		}
		t.Skip("bash not found")
	}
	for _, script := range bashScripts {
		dir := t.TempDir()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		c := exec.CommandContext(ctx, bash, "--norc", "--noprofile", "-c", script)
		c.Dir = dir
		c.Env = []string{"PATH=/usr/bin:/bin", "HOME=/root", "LANG=C.UTF-8", "LC_ALL=C"}
		var wantOut bytes.Buffer
		c.Stdout = &wantOut
		c.Stderr = &bytes.Buffer{}
		want := 0
		if err := c.Run(); err != nil {
			var ee *exec.ExitError
			if !errors.As(err, &ee) {
				cancel()
				t.Fatalf("bash: %v", err)
			}
			want = ee.ExitCode()
		}
		cancel()
		out, errs, o := run(t, newFS(), script)
		if out != wantOut.String() || o.ExitCode != want {
			t.Errorf("%s\n  bash: exit %d stdout %q\n  ours: exit %d stdout %q stderr %q", script, want, wantOut.String(), o.ExitCode, out, errs)
		}
	}
}
