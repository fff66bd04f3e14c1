-- Development passwords for the compose stack only (roles.sql creates the
-- roles without passwords unless told). Never use these anywhere else.
ALTER ROLE promptline_owner PASSWORD 'owner-dev-password';
ALTER ROLE promptline_app PASSWORD 'app-dev-password';
