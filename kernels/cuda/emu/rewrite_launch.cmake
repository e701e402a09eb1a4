# Build-time rewrite of a .cu file for the emulator: every `kernel<<<grid, block[, shared[, stream]]>>>(args)`
# becomes `ctrl_emu::launch("kernel", kernel, grid, block...)(args)` (the name for the launch counters) (and dynamic shared memory, below); nothing else changes, and a #line keeps
# compiler messages and __FILE__ pointing at the original. Usage: cmake -DIN=x.cu -DOUT=x.cpp -P this.
file(READ "${IN}" src)
# the kernel: a name, optionally qualified and with one level of template arguments (k<T, 4>);
# the launch configuration may contain `->` but no other `>`
string(REGEX REPLACE "([A-Za-z_][A-Za-z0-9_:]*(<[^<>;]*>)?)<<<(([^>]|->)*)>>>" "ctrl_emu::launch(\"\\1\", \\1, \\3)" src
       "${src}")
# `extern __shared__ T name[];` (dynamic shared memory) becomes a pointer to the launch's buffer.
string(REGEX REPLACE "extern[ \t]+__shared__[ \t]+([A-Za-z_][A-Za-z0-9_ ]*[A-Za-z0-9_])[ \t]+([A-Za-z_][A-Za-z0-9_]*)\\[\\]"
       "\\1 *const \\2 = static_cast<\\1 *>(ctrl_emu::dynamic_shared())" src "${src}")
file(WRITE "${OUT}.tmp" "#line 1 \"${IN}\"\n${src}")
file(RENAME "${OUT}.tmp" "${OUT}")
