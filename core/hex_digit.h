/* The value of one hexadecimal digit: what the template lexer's \x/\u escapes and the tokenizer's
 * <0xNN> byte tokens are read with. */
#ifndef CTRL_CORE_HEX_DIGIT_H
#define CTRL_CORE_HEX_DIGIT_H

/* 0-15 for 0-9, a-f, A-F; -1 for any other character. */
static inline int ctrl_hex_digit(char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

#endif
