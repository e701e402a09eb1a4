/* Unicode tables for NFC (generated: core/tokenizer/nfc_tables.c), sorted by code point. */
#ifndef CTRL_CORE_NFC_TABLES_H
#define CTRL_CORE_NFC_TABLES_H

#include <stdint.h>

typedef struct nfc_ccc_entry {
    uint32_t cp;
    uint8_t ccc;
} nfc_ccc_entry;

typedef struct nfc_decomp_entry {
    uint32_t cp;
    uint16_t offset; /* into nfc_decomp_data */
    uint8_t len;
} nfc_decomp_entry;

typedef struct nfc_comp_entry {
    uint32_t first, second, composite;
} nfc_comp_entry;

extern const nfc_ccc_entry nfc_ccc[];
extern const int nfc_ccc_count;
extern const uint32_t nfc_decomp_data[];
extern const nfc_decomp_entry nfc_decomp[];
extern const int nfc_decomp_count;
extern const nfc_comp_entry nfc_comp[]; /* sorted by (first, second) */
extern const int nfc_comp_count;

#endif
