/* osr-gateway: placeholder main, replaced below in this session. */
int main(void) { return 0; }
